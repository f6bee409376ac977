#!/bin/sh
# From the repository root, with the package installed (editable) from branch selfspec.
# The shared machine was slow (load 11-24 from other sessions): the rows ran in niced processes side
# by side, each writing its own folder; each was stopped with SIGINT at the deadline (the row in
# flight is lost; finished rows and their samples are kept). compare.py reads them all; a label
# measured in a later folder replaces an earlier one (the AR-mode row of n240 lost its samples when
# that process was stopped, and was measured again in n240_e).
D=measurements/selfspec_2026-11-29
run() { OMP_NUM_THREADS=1 nice -n 10 python $D/measure.py $D/$1 20 $2 > $D/$1.log 2>&1; }
run n240 generate,ar_mode &
run n240_c psd &
run n240_b s2d2 &
run n240_d simsd &
run n240_e ar_mode &
wait
python $D/compare.py $D/compare.md $D/n240 $D/n240_c $D/n240_b $D/n240_d $D/n240_e
