"""The Dataflow model on top of the core API, and the scenario harness that replays scripted inputs."""
