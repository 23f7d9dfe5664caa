"""The benchmark model zoo of X-RLflow, TASO and RLFlow, built in code with `GraphBuilder`.

    from xrlflow_jax import models
    models.list_models()                       # ['inception_v3', ..., 'nasrnn']
    graph, params = models.build("bert")       # the benchmark size
    graph, params = models.build("bert", "tiny", seed=1, capacity=512)

Families: `cnn` (InceptionV3, SqueezeNet 1.1, ResNeXt-50, ResNet-18, ResNet-50), `transformers`
(BERT, ViT, mini-DALL-E, Transformer-Transducer), `nas` (NasNet-A, NasRNN). Every model has a
"default" size (the benchmark) and a "tiny" size (same structure, small dims, for tests).
Weights are random (fan-in scaled normals, random biases and norm scales), fixed by `seed`.
"""

from xrlflow_jax.models import cnn, nas, transformers  # registers the models
from xrlflow_jax.models.registry import (SIZES, ModelInfo, build, builder, default_capacity,
                                         list_models, model_info)

__all__ = ["SIZES", "ModelInfo", "build", "builder", "cnn", "default_capacity", "list_models",
           "model_info", "nas", "transformers"]
