"""The Dataflow model on top of the core API: windows, triggers, panes, accumulation modes,
combiners, and the scenario harness that replays scripted inputs.
"""
