"""The composition root: the `clawgym` command, wiring every layer below it (nothing imports this package).

`app` is the Typer application (`clawgym_cli.app`); `compare` is the white-box vs black-box experiment,
which composes the trainers and the evaluation and so lives here, above both.
"""
