#!/bin/sh
# From the repository root, with the package installed (editable) from branch selfspec.
# The shared machine was slow (load 11-24 from other sessions): the rows ran in niced processes side
# by side, each writing its own folder, and all finished except n240's, which was a full run
# stopped (kill) after its AR-mode row, its later kinds measured by the other processes. compare.py
# reads every folder; a label measured again in a later folder replaces the earlier one (n240's
# AR-mode samples were cut short by the stop, so the row was measured again in n240_e: same figures).
D=measurements/selfspec_2026-11-29
run() { OMP_NUM_THREADS=1 nice -n 10 python $D/measure.py $D/$1 20 $2 > $D/$1.log 2>&1; }
run n240 generate,ar_mode &
run n240_c psd &
run n240_b s2d2 &
run n240_d simsd &
run n240_e ar_mode &
wait
# S2D2's hysteresis rows again after a fix (commit "s2d2: a token-shifted block start is committed
# unrouted"): they replace n240_b's Config-A rows in the table
OMP_NUM_THREADS=1 nice -n 10 python $D/measure.py $D/n240_f 20 s2d2 Config-A > $D/n240_f.log 2>&1
python $D/compare.py $D/compare.md $D/n240 $D/n240_c $D/n240_b $D/n240_d $D/n240_e $D/n240_f
