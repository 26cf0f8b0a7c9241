"""AdamW with bitsandbytes' state: 8-bit (two 1-byte states plus one FP32 absmax per 256-value
block for each; 8-bit state needs sm_60+, which a P40 has) or 32-bit, paged to host memory under
pressure or not. bitsandbytes runs them on the CPU too."""

from finetune_api.optimizers import Optimizer, register

FP32 = 4
EIGHT_BIT = 2 + 2 * FP32 / 256

register(
    Optimizer(
        "paged_adamw_8bit",
        EIGHT_BIT,
        "finetune_trainer.training.optim:paged_adamw_8bit",
        "bitsandbytes' paged 8-bit AdamW (the default)",
        order=10,
    )
)
register(
    Optimizer(
        "paged_adamw_32bit",
        2 * FP32,
        "finetune_trainer.training.optim:paged_adamw_32bit",
        "bitsandbytes' paged 32-bit AdamW",
        order=20,
    )
)
register(
    Optimizer(
        "adamw_8bit", EIGHT_BIT, "finetune_trainer.training.optim:adamw_8bit", "bitsandbytes' 8-bit AdamW", order=30
    )
)
