"""Routers: which replica of a simulated cluster takes a request (see ``base``)."""
