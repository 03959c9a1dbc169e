from meds_cli.app import app

app(prog_name="meds")
