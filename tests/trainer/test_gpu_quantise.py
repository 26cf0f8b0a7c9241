"""fsdp's loading quantises on the rank's GPU and keeps the result on the host: the packed
weight and its quantisation state must be bit-identical to quantising on the GPU and staying.

Needs a GPU (skipped in CI, which has none); run on a GPU machine with
`python tests/trainer/test_gpu_quantise.py` (no pytest needed there).
"""

import pytest
import torch

needs_gpu = pytest.mark.gpu  # skipped where no CUDA GPU is visible (tests/conftest.py)


@needs_gpu
def test_quantising_for_the_host_on_the_gpu_matches_the_gpu_path_bit_for_bit() -> None:
    from bitsandbytes.nn.modules import Params4bit

    from finetune_trainer.model.gpu_quantise import quantising_on

    gpu = torch.device("cuda", 0)
    weight = torch.randn(1024, 4096, generator=torch.Generator().manual_seed(0))
    kwargs = {"requires_grad": False, "quant_type": "nf4", "compress_statistics": True, "quant_storage": torch.float32}
    direct = Params4bit(weight.clone(), **kwargs).to(gpu)
    with quantising_on(gpu):
        hosted = Params4bit(weight.clone(), **kwargs).to("cpu")
    assert hosted.device.type == "cpu" and hosted.bnb_quantized
    assert hosted.quant_state.absmax.device.type == "cpu"
    assert torch.equal(hosted.data.view(torch.uint8), direct.data.cpu().view(torch.uint8))
    assert torch.equal(hosted.quant_state.absmax, direct.quant_state.absmax.cpu())
    assert torch.equal(hosted.quant_state.state2.absmax, direct.quant_state.state2.absmax.cpu())
    # Outside the context the CPU path is bitsandbytes' own again.
    assert Params4bit._quantize.__name__ == "_quantize" and Params4bit._quantize.__qualname__.startswith("Params4bit")


if __name__ == "__main__":
    test_quantising_for_the_host_on_the_gpu_matches_the_gpu_path_bit_for_bit()
    print("gpu_quantise: bit-identical")
