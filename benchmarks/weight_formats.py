import time, torch, os, statistics
torch.set_num_threads(int(os.environ.get("T", "2")))
from kvmap import LLM, SamplingParams
llms = {q: LLM(quantization=q, kv_memory="64MiB") for q in (None, "int8", "w8a8", "int4")}
res = {q: [] for q in llms}
prompt = list(range(1000, 1128))
for rep in range(3):
    for q, llm in llms.items():
        llm.generate([prompt], SamplingParams(max_tokens=2, ignore_eos=True))
        t0 = time.perf_counter(); o = llm.generate([prompt], SamplingParams(max_tokens=33, ignore_eos=True))[0]
        m = o.metrics.token_times_s; res[q].append(32 / (m[-1] - m[0]))
b = statistics.median(res[None])
for q in llms:
    print(f"{str(q):6s} batch-1 decode {statistics.median(res[q]):6.1f} tok/s  x{statistics.median(res[q])/b:.2f} vs bf16 weights  weight_bytes {llms[q].weight_bytes()/1e6:.1f} MB")
print("load", os.getloadavg())
