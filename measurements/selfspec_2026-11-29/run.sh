#!/bin/sh
# From the repository root, with the package installed (editable) from branch selfspec:
OMP_NUM_THREADS=1 nice -n 10 python measurements/selfspec_2026-11-29/measure.py measurements/selfspec_2026-11-29/n240 20 generate,ar_mode,psd \
    > measurements/selfspec_2026-11-29/n240.log 2>&1
# The shared machine was slow (load 11): S2D2 and SimSD rows ran in a second process beside it.
OMP_NUM_THREADS=1 nice -n 10 python measurements/selfspec_2026-11-29/measure.py measurements/selfspec_2026-11-29/n240_b 20 s2d2,simsd \
    > measurements/selfspec_2026-11-29/n240_b.log 2>&1
python measurements/selfspec_2026-11-29/compare.py measurements/selfspec_2026-11-29/compare.md \
    measurements/selfspec_2026-11-29/n240 measurements/selfspec_2026-11-29/n240_b
