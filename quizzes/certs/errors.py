"""The one error the certificate tools raise: its message is the reason shown to the user, never a traceback."""


class CertError(Exception):
    """A refused operation or an invalid credential; str(error) says why."""
