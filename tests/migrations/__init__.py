"""Tests for migrations, grouped by Hermes version range."""
