"""Configuration: `loader` (the typed, validated config and its file loader), `types` (durations, sections, YAML
errors), `doc` (writes docs/configuration.md from the models)."""
