import json
import sys

import mlx.core as mx
from mlx_lm.models import llama

rope_theta = float(sys.argv[1]) if len(sys.argv) > 1 else 10000.0
args = llama.ModelArgs(
    model_type="llama",
    hidden_size=64,
    num_hidden_layers=2,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    rms_norm_eps=1e-6,
    vocab_size=128,
    max_position_embeddings=64,
    rope_theta=rope_theta,
    tie_word_embeddings=False,
)
model = llama.Model(args)
weights = model.sanitize(mx.load("weights.safetensors"))
model.load_weights(list(weights.items()))
# norm=F: a conversion slip, layer 1's post-attention norm weight scaled by F
scale = next((float(a[5:]) for a in sys.argv[2:] if a.startswith("norm=")), None)
if scale is not None:
    norm = model.model.layers[1].post_attention_layernorm
    norm.weight = norm.weight * scale
with open("ids.json") as fh:
    ids = mx.array(json.load(fh))
if "generate" in sys.argv[2:]:  # mlx-lm's own loop: the prompt's last token alone
    from mlx_lm.generate import generate_step

    tokens = [token for token, _ in generate_step(ids[0], model, max_tokens=4)]
    logits = mx.array(tokens)
else:
    logits = model(ids)
mx.eval(logits)
print("port done", logits.shape, logits.flatten()[-4:].tolist())
