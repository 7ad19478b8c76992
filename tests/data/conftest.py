"""Fixtures shared by the data tests."""

import socket

import pytest


@pytest.fixture
def no_network(monkeypatch):
    """Fails the test on any attempt to open a network connection."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
