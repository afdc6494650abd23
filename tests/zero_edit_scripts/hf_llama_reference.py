import json
import math
import sys

import torch
import transformers
from safetensors.torch import save_file

config = transformers.LlamaConfig(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    max_position_embeddings=64,
    tie_word_embeddings=False,
    attn_implementation="eager",
    use_cache=False,
)
torch.manual_seed(0)
model = transformers.LlamaForCausalLM(config).eval()
with torch.no_grad():
    for name, p in model.named_parameters():
        if p.dim() == 2:
            p.normal_(0.0, 1.0 / math.sqrt(p.shape[1]) if "embed" not in name else 1.0)
if "bfloat16" in sys.argv[1:]:  # the model in bfloat16, its weights written so
    model = model.to(torch.bfloat16)
save_file({k: v.contiguous() for k, v in model.state_dict().items()}, "weights.safetensors")
ids = torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(1))
with open("ids.json", "w") as fh:
    json.dump(ids.tolist(), fh)
with torch.no_grad():
    if "generate" in sys.argv[1:]:  # greedy decoding with a cache: one call per token
        logits = model.generate(
            ids, max_new_tokens=4, do_sample=False, use_cache=True, pad_token_id=0
        )
    else:
        logits = model(input_ids=ids).logits
print("reference done", tuple(logits.shape), logits.flatten()[-4:].tolist())
