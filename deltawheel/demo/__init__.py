"""The demo pipeline (Zeitgeist-style bucket counts) and its input generator."""
