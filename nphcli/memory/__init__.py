"""memory"""
