"""What a design's client and its provisioning share: names of routines and statements, their
arguments, answer formats and the schema version. Both sides import it; it imports neither."""
