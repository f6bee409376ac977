cd /work/wt/serving && . .venv/bin/activate
for round in 1 2; do
  sed -i 's/socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)/socket.socket(socket.AF_INET, socket.SOCK_STREAM)/' dllm_decode/serve/app.py
  (cd /tmp/serving && OMP_NUM_THREADS=1 python -m dllm_decode bench serving --requests 64 --clients 16 --max-batch 16 --json measurements/cpu_2026-11-29/serving/ab_before_$round.json > measurements/cpu_2026-11-29/serving/ab_before_$round.txt 2>&1)
  git checkout dllm_decode/serve/app.py
  (cd /tmp/serving && OMP_NUM_THREADS=1 python -m dllm_decode bench serving --requests 64 --clients 16 --max-batch 16 --json measurements/cpu_2026-11-29/serving/ab_after_$round.json > measurements/cpu_2026-11-29/serving/ab_after_$round.txt 2>&1)
done
echo done > /tmp/serving/ab.done
