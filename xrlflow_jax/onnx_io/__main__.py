"""`python -m xrlflow_jax.onnx_io info model.onnx [--input-shape name=1,3,224,224]`."""

import sys

from xrlflow_jax.onnx_io.cli import main

if __name__ == "__main__":
  sys.exit(main())
