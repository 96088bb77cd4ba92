# Random small bf16 models on the GPU, each trained with every GEMM provider (issue 24's bf16 NaN
# hunt): reports non-finite losses and failed runs. Usage: python3 bench/gpu_bf16_fuzz.py TRAIN N OUTDIR
import random, subprocess, sys, os, re
train, n, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
os.makedirs(out, exist_ok=True)
random.seed(24)
bad = 0
for i in range(n):
    S = random.choice([4, 8, 16]); B = random.choice([4, 64, 256]); C = random.choice([1, 2, 3])
    W = random.choice([1, 2, 3, 8, 12, 16])
    layers = [f"{{linear: {{units: {W}, activation: {random.choice(['relu','gelu','none'])}}}}}"]
    for _ in range(random.choice([0, 1, 2])):
        H = random.choice([1, 2, 4]); hd = random.choice([8, 16])
        kv = random.choice([k for k in (1, 2, 4) if H % k == 0])
        a = [f"heads: {H}", f"kv_heads: {kv}", f"head_dim: {hd}"]
        if random.random() < .5: a.append("causal: true")
        if random.random() < .3: a.append(f"window: {{left: {random.randint(1, S)}}}")
        if random.random() < .3: a.append(f"sinks: {random.randint(1, 2)}")
        if random.random() < .4: a.append("sink_logits: true")
        if random.random() < .6: a.append("residual: true")
        layers.append("{attention: {" + ", ".join(a) + "}}")
        layers.append(f"{{linear: {{units: {random.choice([1,2,3,8,12])}, activation: {random.choice(['relu','gelu','none'])}}}}}")
    layers.append("{linear: {units: 1}}")
    cfg = (f"name: g{i}\nseed: {i}\nprecision: bf16\n"
           f"data: {{kind: sine, window: {S}, channels: {C}, samples: 2048, target: sequence}}\n"
           f"model: {{input: [{S}, {C}], layers: [{', '.join(layers)}]}}\n"
           f"train: {{batch_size: {B}, steps: 4, log_every: 1, optimizer: {{lr: {random.choice([1e-3, 1e-2])}}}}}\n"
           f"compiler: {{fuse: true}}\n")
    path = f"{out}/g{i}.yaml"
    open(path, "w").write(cfg)
    for gemm in ("cublaslt", "auto", "generated"):
        p = subprocess.run([train, "-c", path, "--device", "cuda", "--progress", "lines", "--set", f"compiler.gemm={gemm}"],
                           capture_output=True, text=True, timeout=300)
        losses = re.findall(r"loss (\S+)", p.stdout)
        nonfinite = any(x in ("nan", "-nan", "inf", "-inf") for x in losses)
        if p.returncode != 0 or nonfinite:
            bad += 1
            print(f"g{i} gemm={gemm} rc={p.returncode} losses={losses[:4]} err={p.stderr.strip()[-300:]}", flush=True)
            print(cfg, flush=True)
    print(f"g{i} done ({bad} failures so far)", flush=True)
print(f"{n} models x 3 providers: {bad} failures", flush=True)
