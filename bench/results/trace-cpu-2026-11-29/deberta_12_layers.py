"""bench/trace_time.py on a 12-layer DeBERTa-v2 (v3-base's attention, width 256): the `--small`
model with deberta-v3-base's depth. Same flags as trace_time.py (`--model` stays deberta_v2)."""
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/
import torch  # noqa: E402
import run as bench  # noqa: E402
import trace_time  # noqa: E402


def build(small):
    from transformers import DebertaV2Config, DebertaV2ForMaskedLM
    config = DebertaV2Config(
        vocab_size=1024, hidden_size=256, num_hidden_layers=12, num_attention_heads=4,
        intermediate_size=512, relative_attention=True, pos_att_type=["p2c", "c2p"],
        position_buckets=256, max_relative_positions=-1, share_att_key=True,
        norm_rel_ebd="layer_norm", position_biased_input=False, max_position_embeddings=512)
    ids = torch.randint(0, config.vocab_size, (2, 64))
    return bench.LanguageModelLoss(DebertaV2ForMaskedLM(config)), (ids,)


bench.MODELS["deberta_v2"] = dataclasses.replace(bench.MODELS["deberta_v2"], build=build)
trace_time.main()
