"""``interop.to_torch`` / ``from_torch`` for today's decoders: a ``Decoder`` becomes the
``transformers`` model of the family whose switches it has, with the same logits, and comes
back unchanged (tiny random checkpoints of ``decoder_util.py``)."""
import numpy as np
import pytest

from support import need

torch = need("torch")
transformers = need("transformers")

import minitx  # noqa: E402
import minitx.interop as interop  # noqa: E402
import minitx.pretrained as pt  # noqa: E402
from decoder_util import CASES, tiny_decoder  # noqa: E402
from minitx.models import Decoder, DecoderConfig  # noqa: E402
from support import to_host  # noqa: E402

IDS = np.random.default_rng(1).integers(3, 97, (2, 11))
HF_CLASS = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
            "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
            "gemma3_text": "Gemma3ForCausalLM", "olmo2": "Olmo2ForCausalLM",
            "deepseek_v3": "DeepseekV3ForCausalLM", "mixtral": "MixtralForCausalLM",
            "qwen3_moe": "Qwen3MoeForCausalLM", "gpt_oss": "GptOssForCausalLM",
            "olmo3": "Olmo3ForCausalLM", "smollm3": "SmolLM3ForCausalLM",
            "minimax_m2": "MiniMaxM2ForCausalLM", "glm4_moe": "Glm4MoeForCausalLM",
            "nanochat": "NanoChatForCausalLM", "llama4_text": "Llama4ForCausalLM"}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("interop-decoders")


@pytest.mark.parametrize("case", sorted(CASES))
def test_to_torch_gives_the_family_with_the_same_logits_and_back(root, case):
    model, _ = pt.load(tiny_decoder(root, case), dtype="float64", tokenizer=False)
    theirs = interop.to_torch(model)
    assert type(theirs).__name__ == HF_CLASS[CASES[case][0]]
    assert not theirs.training and next(theirs.parameters()).dtype == torch.float64
    with torch.no_grad():
        ref = theirs(torch.tensor(IDS)).logits.numpy()
    mine = model(IDS).numpy()
    # HF's float32 norms and rotary tables, as in test_pretrained_decoders.py
    assert np.abs(mine - ref).max() <= 1e-5 * np.abs(ref).max()
    back = interop.from_torch(theirs)
    assert back.config == model.config
    for key, value in model.state_dict().items():
        np.testing.assert_array_equal(to_host(back.state_dict()[key]), to_host(value))


def test_a_decoder_built_here_with_a_familys_switches_exports():
    minitx.manual_seed(0)
    model = Decoder(DecoderConfig(vocab_size=50, hidden_size=32, num_heads=4, num_kv_heads=2,
                                  qk_norm="head", tie_embeddings=False)).to(dtype="float64")
    theirs = interop.to_torch(model)
    assert type(theirs).__name__ == "Qwen3ForCausalLM"
    with torch.no_grad():
        ref = theirs(torch.tensor(IDS % 50)).logits.numpy()
    assert np.abs(model(IDS % 50).numpy() - ref).max() <= 1e-5 * np.abs(ref).max()


def test_a_decoder_no_family_has_is_refused():
    model = Decoder(DecoderConfig(vocab_size=50, hidden_size=32, norm="layernorm"))
    with pytest.raises(ValueError, match="no HuggingFace family runs this DecoderConfig"):
        interop.to_torch(model)


@pytest.mark.parametrize("switches,family", [
    (dict(ffn_hidden=16), "MixtralForCausalLM"),
    (dict(ffn_hidden=24, qk_norm="head", dense_layers=(1,),
          moe_options={"norm_topk_prob": False}), "Qwen3MoeForCausalLM"),
])
def test_a_mixture_of_experts_built_here_exports_to_its_family(switches, family):
    """A Decoder of minitx's own with mlp="moe" becomes the HF family whose switches it
    has (Mixtral: experts as wide as the config's intermediate_size; Qwen3-MoE: QK-norm and
    dense layers), with the same logits."""
    minitx.manual_seed(0)
    model = Decoder(DecoderConfig(vocab_size=50, hidden_size=32, num_heads=4, num_kv_heads=2,
                                  mlp="moe", num_experts=4, top_k=2, expert_hidden=16,
                                  tie_embeddings=False, **switches)).to(dtype="float64")
    theirs = interop.to_torch(model)
    assert type(theirs).__name__ == family
    with torch.no_grad():
        ref = theirs(torch.tensor(IDS % 50)).logits.numpy()
    assert np.abs(model(IDS % 50).numpy() - ref).max() <= 1e-5 * np.abs(ref).max()
    assert interop.from_torch(theirs).config == model.config
