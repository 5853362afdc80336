#!/usr/bin/env python3
"""Prints how the installed transformers names and shapes DeepSeek-V4 parameters.

Run on the GPU machine (transformers with DeepseekV4ForCausalLM is installed there). The output
tells the golden-data script (issue "CPU reference forward ... matched against transformers") how
to map checkpoint names (layers.N.attn.wq_a.weight, ...) onto transformers' names and layouts.
It builds the tiny configuration of dsv4-model.md §14 with random weights; nothing is downloaded.
"""
import inspect
import sys

import torch
import transformers
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

print("transformers", transformers.__version__, "torch", torch.__version__)
defaults = DeepseekV4Config()
print("default config:", defaults.to_json_string(use_diff=False))

kwargs = dict(vocab_size=1024, hidden_size=256, num_hidden_layers=4, num_nextn_predict_layers=1,
              compress_ratios=[0, 4, 128, 4, 0], num_hash_layers=2, num_attention_heads=4,
              num_key_value_heads=1, head_dim=128, qk_rope_head_dim=64, q_lora_rank=128,
              o_groups=2, o_lora_rank=128, sliding_window=16, index_n_heads=4,
              index_head_dim=128, index_topk=8, n_routed_experts=8, num_experts_per_tok=2,
              n_shared_experts=1, moe_intermediate_size=128, max_position_embeddings=4096)
accepted = {k: v for k, v in kwargs.items() if hasattr(defaults, k)}
print("kwargs not attributes of DeepseekV4Config:", sorted(set(kwargs) - set(accepted)))
cfg = DeepseekV4Config(**kwargs)
print("layer_types:", getattr(cfg, "layer_types", None))
torch.manual_seed(0)
model = DeepseekV4ForCausalLM(cfg)
for name, tensor in model.state_dict().items():
    print(f"{name}\t{tuple(tensor.shape)}\t{tensor.dtype}")
ids = torch.randint(0, 1024, (1, 300))
with torch.no_grad():
    out = model(ids)
print("forward ok, logits", tuple(out.logits.shape))
src = inspect.getsourcefile(DeepseekV4ForCausalLM)
print("modeling source:", src)
sys.stdout.flush()
