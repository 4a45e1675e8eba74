"""The path registry's SM gates against FlashInfer's own declarations (mm_bf16.is_backend_supported(backend, cc),
the lists its requirement functions carry), for every SM a profile names and the SMs FlashInfer lists. Needs only
FlashInfer importable (the GPU machines have it; CI does not), so it carries the gpu marker. Written from FlashInfer
0.7.2.post1's source; passed on an H200 with FlashInfer 0.7.2.post1 (harness eb53cf1)."""
import pytest

pytestmark = pytest.mark.gpu

SMS = (80, 86, 89, 90, 100, 103, 107, 110, 120, 121)


def test_registry_sm_gates_match_flashinfer():
    flashinfer = pytest.importorskip("flashinfer")
    from dispatch.backends import BACKENDS
    from dispatch.profiles import PROFILES
    mm = flashinfer.mm_bf16
    wrong = []
    for name, backend in BACKENDS.items():
        for sm in sorted(set(SMS) | {p.sm for p in PROFILES.values()}):
            ours = backend.sms is None or sm in backend.sms
            theirs = bool(mm.is_backend_supported(name, sm))
            if ours != theirs:
                wrong.append(f"{name} on SM{sm}: registry {ours}, FlashInfer {theirs}")
    assert not wrong, "; ".join(wrong)


def test_every_profile_backend_is_one_flashinfer_runs_on_its_sm():
    flashinfer = pytest.importorskip("flashinfer")
    from dispatch.profiles import PROFILES
    for p in PROFILES.values():
        for b in p.flashinfer_backends:
            assert flashinfer.mm_bf16.is_backend_supported(b, p.sm), (p.name, b)
