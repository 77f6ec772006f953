"""The sandbox marketplace: a local Vast.ai look-alike reached over HTTP only (see README.md)."""
