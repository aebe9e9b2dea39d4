"""The whole system on one machine: `llmfleet up`, the pod runner and the engines behind pods."""
