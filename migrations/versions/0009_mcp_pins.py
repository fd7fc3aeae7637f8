"""MCP tool pins: each server's tool definitions as first seen and as the admin trusts them.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-07

A tool list an MCP server sends can change under us (a rug pull: a tool's description turned into
instructions after the admin looked). `mcp_servers` marks a server whose list was seen;
`mcp_tools` keeps, per tool, the fingerprint the admin trusts (`pinned`) and the one last listed
(`seen`), so a changed or new tool is withheld until `openclaw mcp trust NAME`.

Written by hand and frozen, like 0001: types are spelled out, not imported from the models.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | None = None
depends_on: str | None = None

ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "mcp_servers",
        sa.Column("id", ID, primary_key=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("first_seen_at", TS, nullable=False),
        sa.Column("seen_at", TS, nullable=False),
        sa.Column("trusted_at", TS, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_mcp_servers"),
        sa.UniqueConstraint("name", name="uq_mcp_servers_name"),
    )
    op.create_table(
        "mcp_tools",
        sa.Column("id", ID, primary_key=True),
        sa.Column("server_id", ID, nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("pinned", sa.String(80), nullable=True),
        sa.Column("seen", sa.String(80), nullable=True),
        sa.Column("note", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_mcp_tools"),
        sa.ForeignKeyConstraint(["server_id"], ["mcp_servers.id"], ondelete="CASCADE",
                                name="fk_mcp_tools_server_id_mcp_servers"),
        sa.UniqueConstraint("server_id", "name", name="uq_mcp_tools_server_id_name"),
    )


def downgrade() -> None:
    op.drop_table("mcp_tools")
    op.drop_table("mcp_servers")
