"""``gpuwatchd doctor``: checks a GPU host the way set-up guides' troubleshooting sections do (docs/egpu.md)."""
