"""A small sample Functions app (not the product) that shows devhost hosts any df.DFApp."""
