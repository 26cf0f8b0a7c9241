"""The in-image trainer: Pascal-safe FP32 QLoRA with atomic checkpoints and automatic resume.

Importing the package stays cheap on purpose: the CLI and the planner import submodules
without pulling in torch, and nothing here may ever import kopf (the image has no operator).
"""
