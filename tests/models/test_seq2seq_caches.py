"""The encoder–decoder decodes through each variant's own cache (keys and values, MLA's latent,
a recurrent state): cached greedy decoding gives the tokens the uncached decoding gives."""
import numpy as np
import pytest

import minitx
from minitx.models import Transformer


@pytest.mark.parametrize("attention", [None, "mha", "mla", "retention", "deltanet", "ssd",
                                       "sink", "diff"])
def test_cached_greedy_decoding_equals_uncached(attention):
    minitx.manual_seed(0)
    model = Transformer(13, 13, d_model=16, nhead=2, num_encoder_layers=1, num_decoder_layers=2,
                        dim_feedforward=32, dropout=0.0, attention=attention).double().eval()
    src = minitx.tensor(np.random.default_rng(1).integers(3, 13, size=(2, 7)))
    cached = model.greedy_decode(src, max_len=9, bos_idx=1, use_cache=True)
    plain = model.greedy_decode(src, max_len=9, bos_idx=1, use_cache=False)
    assert cached.tolist() == plain.tolist()
