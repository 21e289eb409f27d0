"""specmatch: does speculative decoding pay off on your traffic?"""
__version__ = "0.1.0"
