"""QQP pair probe ([u, v, |u-v|, u*v]) of the converted MiniLM (runs/convert/favor64_batched)
against the softmax teacher: 2,000 training pairs, 2,000 random dev pairs."""
import json, torch
from coulomb_attention.convert import ConvertConfig, run_probes
from coulomb_attention.nn.pretrained import load_pretrained_encoder, load_pretrained_tokenizer, resolve_checkpoint_dir
torch.set_num_threads(1)
cfg = ConvertConfig(probe_tasks=("qqp",), probe_train=2000, probe_eval=2000)
ck = "runs/convert/favor64_batched/checkpoint"
out = {}
d = resolve_checkpoint_dir("minilm")
out["teacher"] = run_probes(load_pretrained_encoder(d, "softmax"), load_pretrained_tokenizer(d), cfg, "../shared/data")["qqp"]
out["converted"] = run_probes(load_pretrained_encoder(ck), load_pretrained_tokenizer(ck), cfg, "../shared/data")["qqp"]
print(json.dumps(out, indent=1))
json.dump(out, open("runs/convert/qqp_probe.json", "w"), indent=1)
