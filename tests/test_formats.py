"""Every harness file carries a format number; each reader takes the formats it knows (no key: format 1) and refuses
any other in one line that names the version and the fix."""
import json
import math

import pytest

from harness.errors import HarnessError


def _refused(call, says="format 9"):
    with pytest.raises(HarnessError) as err:
        call()
    assert says in str(err.value) and "\n" not in str(err.value)


def test_a_table_of_an_unknown_format_is_refused(tmp_path):
    from dispatch.table import load_table
    f = tmp_path / "t.json"
    f.write_text(json.dumps({"format": 9, "profile": "h200", "low_m_backend": "tinygemm", "default": {}}))
    _refused(lambda: load_table(path=f))


def test_a_table_run_manifest_of_an_unknown_format_is_refused(tmp_path):
    from tables.manifest import MANIFEST, MANIFEST_FORMAT, read_manifest
    (tmp_path / MANIFEST).write_text(json.dumps({"format": 9, "legs": {}}))
    _refused(lambda: read_manifest(tmp_path / MANIFEST))
    (tmp_path / MANIFEST).write_text(json.dumps({"legs": {}}))  # written before the key: format 1
    assert read_manifest(tmp_path / MANIFEST) == {"legs": {}} and MANIFEST_FORMAT == 1


def test_noise_floors_say_their_format_and_refuse_another(tmp_path):
    from calibrate.forward_noise import ForwardFloor, load_forward_floor
    from calibrate.noise import NoiseFloor, load_noise
    floor = NoiseFloor(((10.0, 0.01), (float("inf"), 0.02)))
    assert floor.to_json()["format"] == 1
    f = tmp_path / "n.json"
    f.write_text(json.dumps(floor.to_json()))
    assert load_noise("h200", f).bands == floor.bands
    f.write_text(json.dumps({**floor.to_json(), "format": 9}))
    _refused(lambda: load_noise("h200", f))
    fwd = ForwardFloor({"graph": 0.01, "eager": 0.1}, 0.95, {})
    assert fwd.to_json()["format"] == 1
    f.write_text(json.dumps({**fwd.to_json(), "format": 9}))
    _refused(lambda: load_forward_floor("h200", f))


def test_the_evidence_manifest_says_its_format():
    from evidence_store.store import MANIFEST_FORMAT, load_manifest
    assert load_manifest()["format"] == MANIFEST_FORMAT


def test_a_floor_measured_on_another_gpu_kind_is_refused_in_one_line(tmp_path):
    """A floor names the profile it was measured on; given to judge another, it is refused (one naming none, written
    before the field, is taken)."""
    from calibrate.forward_noise import ForwardFloor, load_forward_floor
    from calibrate.noise import NoiseFloor, load_noise
    f = tmp_path / "n.json"
    f.write_text(json.dumps(NoiseFloor(((math.inf, 0.02),), 0.95, {"profile": "h200"}).to_json()))
    assert load_noise("h200", f).bands == ((math.inf, 0.02),)
    with pytest.raises(HarnessError, match="measured on h200, not h100; pass a h100 floor"):
        load_noise("h100", f)
    f.write_text(json.dumps(ForwardFloor({"graph": 0.01}, 0.95, {"profile": "h100"}).to_json()))
    with pytest.raises(HarnessError, match="calibrate forward-noise RUN_A RUN_B --gpu h200"):
        load_forward_floor("h200", f)
    f.write_text(json.dumps(ForwardFloor({"graph": 0.01}, 0.95, {}).to_json()))
    assert load_forward_floor("h100", f).half_widths == {"graph": 0.01}
