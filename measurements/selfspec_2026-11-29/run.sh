#!/bin/sh
# From the repository root, with the package installed (editable) from branch selfspec:
OMP_NUM_THREADS=1 nice -n 10 python measurements/selfspec_2026-11-29/measure.py measurements/selfspec_2026-11-29/n240 20 \
    > measurements/selfspec_2026-11-29/n240.log 2>&1
