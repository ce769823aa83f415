"""A fake of Stripe's MCP server (``mcp.stripe.com``) over a :class:`FakeStripe`'s state.

Built on the official ``mcp`` SDK's server side (FastMCP, Streamable HTTP, served by uvicorn
on loopback), so clients meet a real MCP server; needs the ``mcp`` extra.
"""

from __future__ import annotations

from .server import FakeStripeMcp, McpFailure

__all__ = ["FakeStripeMcp", "McpFailure"]
