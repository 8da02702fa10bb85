"""llamactor on Ray Serve (``pip install 'llamactor[ray]'``): one llamactor tree per Ray Serve
replica, the same OpenAI app as ingress, our routing policies as Ray's request router."""
