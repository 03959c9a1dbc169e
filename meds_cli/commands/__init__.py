"""Layer 4, the command modules behind `meds_cli/app.py`: each parses nothing itself and drives
the engine for one command. Nothing outside the command line imports them."""
