"""TF Serving's APIs (REST and gRPC) for exported models."""
