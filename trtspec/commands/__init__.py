"""One module per CLI verb; each exports `command` (a click.Command)."""
