"""Small bundled PyTorch and MLX models for the demo and the tutorial.

Importing this package imports no framework: the demo and tutorial run the examples as
scripts (``python -m mldbg.examples.NAME``) and only read the facts below.
"""

from pathlib import Path

HERE = Path(__file__).resolve().parent
# The parity pair: a PyTorch reference and an MLX port with one planted porting mistake.
PARITY_REFERENCE = "mldbg.examples.parity_reference"
PARITY_PORT = "mldbg.examples.parity_port"
PARITY_PLANTED_MISTAKE = "layers.0.attn"
PARITY_MISTAKE = "attention scores scaled by 1/head_dim instead of 1/sqrt(head_dim)"
# The MLX track's NaN (tutorial_nonfinite.py): where break --nonfinite stops.
NONFINITE_ORIGIN = "layers.0.norm"
