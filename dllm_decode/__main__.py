"""`python -m dllm_decode`: the `dllm-decode` command line."""

from dllm_decode.cli import main

main(prog_name="dllm-decode")
