"""The request view: from a stored branch to the valid request the host sends its model."""
