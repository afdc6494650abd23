"""A 2-way tensor-parallel transformers Llama (Megatron style) on gloo, and its reference.

python tp_llama.py            -> the single-process reference
torchrun --nproc_per_node 2 tp_llama.py  -> each rank holds half of the attention heads
(q/k/v column parallel, split by heads: 2 of the 4 query heads and 1 of the 2 key/value
heads) and half of the MLP (gate/up column parallel); o_proj and down_proj are row
parallel: their partial sums are all-reduced by a hook on the attention and the MLP,
whose outputs are then whole on every rank.
torchrun --nproc_per_node 2 tp_llama.py bug  -> rank 1 loads rank 0's key head.
"""

import os
import sys

import torch
import torch.distributed as dist
import transformers

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INNER = 64, 4, 2, 16, 128


def config(world: int) -> transformers.LlamaConfig:
    return transformers.LlamaConfig(
        vocab_size=96,
        hidden_size=HIDDEN,
        intermediate_size=INNER // world,
        num_hidden_layers=2,
        num_attention_heads=HEADS // world,
        num_key_value_heads=KV_HEADS // world,
        head_dim=HEAD_DIM,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
        use_cache=False,
    )


torch.manual_seed(0)
full = transformers.LlamaModel(config(1)).eval()
ids = torch.randint(0, 96, (1, 8), generator=torch.Generator().manual_seed(1))
if "RANK" in os.environ:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = transformers.LlamaModel(config(world)).eval()
    state = full.state_dict()
    q_rows, kv_rows, inner = HEADS * HEAD_DIM // world, KV_HEADS * HEAD_DIM // world, INNER // world
    shard = {}
    for name, value in state.items():
        if name.endswith(("q_proj.weight",)):
            value = value[rank * q_rows : (rank + 1) * q_rows]
        elif name.endswith(("k_proj.weight", "v_proj.weight")):
            own = 0 if ("bug" in sys.argv[1:] and name.endswith("k_proj.weight")) else rank
            value = value[own * kv_rows : (own + 1) * kv_rows]
        elif name.endswith("o_proj.weight"):
            value = value[:, rank * q_rows : (rank + 1) * q_rows]
        elif name.endswith(("gate_proj.weight", "up_proj.weight")):
            value = value[rank * inner : (rank + 1) * inner]
        elif name.endswith("down_proj.weight"):
            value = value[:, rank * inner : (rank + 1) * inner]
        shard[name] = value
    model.load_state_dict(shard)

    def all_reduce(_module, _args, output):
        dist.all_reduce(output[0] if isinstance(output, tuple) else output)

    for layer in model.layers:
        layer.self_attn.register_forward_hook(all_reduce)
        layer.mlp.register_forward_hook(all_reduce)
    with torch.no_grad():
        out = model(ids).last_hidden_state
    dist.destroy_process_group()
else:
    with torch.no_grad():
        out = full(ids).last_hidden_state
print("done", float(out.abs().sum()))
