"""The learning core: policy models, generation engines, chat context, samples and advantages, losses and the
trainer. Never imports temporalio, docker or boto3."""
