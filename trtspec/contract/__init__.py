"""The speculative loop's interface and the NVIDIA contract it must match (`trtspec.contract.nvidia`)."""
