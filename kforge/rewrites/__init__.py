"""Inference rewrites: changes to a model's ATen graph that keep its outputs to rounding and that Inductor does not
make by default (batch norm folded into the convolution before it; convolution chains run channels-last). A
deployment runs one only where the model's output checks equal to eager's and the model measures faster with it
(``Session.apply(rewrites=...)``)."""
from __future__ import annotations

from ._batch_norm import FOLD_BATCH_NORM, ConvBatchNorm, find_conv_batch_norms, fold_batch_norms, folded
from ._layout import CHANNELS_LAST, channels_last
from ._rewrite import Rewrite, Rewritten, as_rewrites, get_rewrite, register_rewrite, rewrite_names

__all__ = ["CHANNELS_LAST", "FOLD_BATCH_NORM", "ConvBatchNorm", "Rewrite", "Rewritten", "as_rewrites", "channels_last",
           "find_conv_batch_norms", "fold_batch_norms", "folded", "get_rewrite", "register_rewrite", "rewrite_names"]
