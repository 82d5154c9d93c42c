"""placeholder"""
from coleo import tooled

@tooled
def command(rest):
    """(not yet built)"""
    return 1
