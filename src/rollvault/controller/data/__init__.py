"""The data path: dataloader, sampler, replay index, spare prompts, batch shortfall."""
