"""Sampling of particles omega, feature maps (pure functions) and exact kernels."""

from .kernels import gaussian_kernel, softmax_kernel
from .maps import (
    FEATURE_MAPS,
    MAPS,
    FeatureMap,
    attention_maps,
    draw_bias,
    elu_features,
    feature_fn,
    get_feature_map,
    get_map,
    hedgehog_features,
    log_positive,
    positive,
    rff,
    softmax,
    softplus,
)
from .samplers import SAMPLERS, gaussian, get_sampler, orthogonal, sample

__all__ = [
    "FEATURE_MAPS",
    "MAPS",
    "FeatureMap",
    "attention_maps",
    "elu_features",
    "get_map",
    "SAMPLERS",
    "draw_bias",
    "feature_fn",
    "gaussian",
    "gaussian_kernel",
    "get_feature_map",
    "get_sampler",
    "hedgehog_features",
    "log_positive",
    "orthogonal",
    "positive",
    "rff",
    "sample",
    "softmax",
    "softmax_kernel",
    "softplus",
]
