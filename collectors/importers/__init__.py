"""One trace format each into record kinds, through the contract in contract.py."""
