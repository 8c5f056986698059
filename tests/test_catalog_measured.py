"""GPU files added for heterogeneous validation: datasheet peaks and measured GEMM fractions."""

import pytest

from hetpar.catalog import load_gpu

# Dense peaks from the vendor datasheets / whitepapers cited in each file (TFLOP/s).
PEAKS = [
    ("T4-16GB", "fp16", 65.0),
    ("V100-SXM2-16GB", "fp16", 125.0),
    ("RTX-2080-Ti", "fp16", 53.8),  # FP32 accumulate, GeForce half rate
    ("A10", "bf16", 125.0),
    ("L4", "bf16", 121.0),  # 242 with sparsity
]

# Sustained large-GEMM throughput measured by the sources cited in the files (TFLOP/s, FLOPs).
MEASURED_GEMM = [
    ("T4-16GB", 24.0, 2 * 4096**3),  # cuBLAS 4096^3 FP16, power-capped at 70 W
    ("V100-SXM2-16GB", 83.0, 1e12),  # Markidis et al. 2018, cuBLAS mixed precision
]


@pytest.mark.parametrize(("gpu", "precision", "tflops"), PEAKS)
def test_datasheet_peaks(gpu, precision, tflops):
    assert load_gpu(gpu).peak_tflops[precision] == pytest.approx(tflops, rel=0.01)


@pytest.mark.parametrize(("gpu", "tflops", "flops"), MEASURED_GEMM)
def test_large_gemm_matches_the_measurement(gpu, tflops, flops):
    g = load_gpu(gpu)
    achieved = g.peak_tflops["fp16"] * g.matmul_efficiency(flops)
    assert achieved == pytest.approx(tflops, rel=0.03)


def test_every_new_file_says_what_is_measured_and_what_is_assumed():
    for name in ("T4-16GB", "V100-SXM2-16GB", "RTX-2080-Ti", "A10", "L4"):
        text = " ".join(load_gpu(name).sources)
        assert "MEASURED" in text or "NO published" in text, name
        assert "ASSUMED" in text, name
