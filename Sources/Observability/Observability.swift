// Observability
