"""`dbq access install-sql`: the SQL a DBA runs once per database so the operator makes and drops
its roles through dbq's role helper, without CREATEROLE (`dbq.backends.postgres.access`)."""

from __future__ import annotations

import click

from dbq.backends.postgres.access import helper_statements


@click.group()
def access() -> None:
    """Database access for the operator and QueueUsers."""


@access.command("install-sql")
@click.option("--operator", "operator_login", required=True, help="The operator's PostgreSQL login.")
def install_sql(operator_login: str) -> None:
    """Print the role helper's installation for OPERATOR's login: run it as a superuser in each
    database the operator provisions in (`... | psql -d DATABASE`), and give the login CREATE on
    that database. Run it again after upgrading dbq; it changes nothing else."""
    try:
        statements = helper_statements(operator_login)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--operator") from None
    click.echo("BEGIN;")
    for statement in statements:
        click.echo(f"{statement};")
    click.echo("COMMIT;")


COMMANDS = (access,)
