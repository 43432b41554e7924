"""Tests for adopt, grouped by Hermes version range."""
